// Pictures in chat requests (vision, `serve --mmproj`). The OpenAI chat body carries them as
// `image_url` content parts; the Anthropic (`image` blocks) and Responses (`input_image`
// parts) bodies are converted to that shape first. As llama-server does, each picture part
// becomes a text part holding the media marker before the chat template renders the
// messages; the rendered text is then tokenized around the markers, each picture's layout
// and embeddings taking a marker's place (vision/image_prompt.h).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/image_fetch.h"
#include "vision/image.h"

namespace step35::server {

struct ServerContext;

// Whether any message's content holds a picture part.
bool has_image_parts(const nlohmann::ordered_json& messages);

// Replaces every `image_url` part of `messages` by a text part holding the media marker and
// returns the pictures, decoded, in order. ApiError 400 naming the part for a server without
// --mmproj, a URL that is neither a base64 `data:` URL nor an allowed http(s) URL, bad
// base64, a failed fetch, or bytes that are not a picture we decode (PNG, JPEG, BMP, GIF).
std::vector<vision::RgbImage> take_chat_images(const ServerContext& ctx, nlohmann::ordered_json& messages);

// The rendered prompt's tokens with the pictures in place of the markers: request.prompt
// holds a key derived from each picture's pixels at its positions (the prefix cache then
// reuses them only for the same picture) and request.embeddings their rows. ApiError 400
// when the markers and the pictures do not pair up (the text itself holds the marker).
void tokenize_with_images(ServerContext& ctx, const std::string& text, bool add_bos,
                          const std::vector<vision::RgbImage>& images, GenerateRequest& request);

// The picture behind a URL (`param` names the request's field in errors), decoded within
// `limits`: a base64 data: URL, or an http(s) URL fetched as `fetch` allows
// (server/image_fetch.h). ApiError 400 for any other URL, bad base64, a fetch refused or
// failed, or bytes that are not a picture.
vision::RgbImage picture_from_url(const std::string& url, const std::string& param,
                                  const vision::DecodeLimits& limits = {}, const ImageFetchOptions& fetch = {});

// An `image_url` part for a picture given as base64 bytes and a media type (Anthropic's
// `source` of type base64).
nlohmann::json image_url_part(const std::string& url);

}  // namespace step35::server
