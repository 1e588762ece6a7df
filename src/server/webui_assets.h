// The web pages' files (src/server/webui/), compiled into the binary: the build runs
// cmake/embed_webui.cmake, which writes webui_assets.cpp (byte arrays and content types)
// into the build folder. No file is read at run time.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace step35::server {

struct WebAsset {
  std::string_view name;          // the file name in src/server/webui/, e.g. "chat.js"
  std::string_view content_type;  // e.g. "text/javascript; charset=utf-8"
  std::string_view bytes;
};

// Every file of src/server/webui/, sorted by name.
const std::vector<WebAsset>& webui_assets();

}  // namespace step35::server
