// The published chat template of Step 3.5 Flash (stepfun-ai/Step-3.5-Flash, as carried by
// its GGUFs in tokenizer.chat_template): what a model file without a template of its own
// is rendered with. It is model data, kept byte for byte; the conformance suite holds the
// same text (tests/data/chat_templates/templates/stepfun-3.5-flash.jinja) and a test
// checks that the two agree.
#pragma once

#include <string_view>

namespace step35 {

extern const std::string_view kStep35FlashChatTemplate;

}  // namespace step35
