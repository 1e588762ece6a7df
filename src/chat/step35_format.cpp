#include "chat/step35_format.h"

#include <string>

#include "tokenizer/tokenizer.h"

namespace step35::step35_format {

bool prompt_opens_reasoning(std::string_view rendered_prompt, ChatFormat format) {
  if (format != ChatFormat::STEP35) return false;
  const std::string opening = std::string(kThinkOpen) + "\n";
  return rendered_prompt.size() >= opening.size() &&
         rendered_prompt.substr(rendered_prompt.size() - opening.size()) == opening;
}

int32_t think_end_token(const Tokenizer& tok) { return tok.find_token(std::string(kThinkClose)); }

}  // namespace step35::step35_format
