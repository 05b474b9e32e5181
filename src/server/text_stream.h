// Turns a job's tokens into the text a client sees: complete UTF-8 only, cut before the first
// stop string, and never releasing text that may still turn out to be the start of one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace nt {

class StopTextStream {
  public:
    StopTextStream(const Tokenizer& tok, std::vector<std::string> stops);

    // Feeds one token and returns the text that can be released now. Once a stop string has
    // appeared, stopped() is true, the text ends right before it, and later tokens are ignored.
    std::string push(int32_t id);
    // The end of the generation: everything still held back (unless stopped).
    std::string finish();

    bool stopped() const { return stopped_; }
    // Bytes of decoded text before the last pushed token's text began (its text_offset), and
    // bytes released so far; a token contributed to the output iff its offset < released().
    size_t last_token_offset() const { return last_offset_; }
    size_t released() const { return released_; }

  private:
    std::string release(bool final);

    StreamDecoder dec_;
    std::vector<std::string> stops_;
    std::string held_;
    size_t decoded_ = 0, released_ = 0, last_offset_ = 0;
    bool stopped_ = false;
};

}  // namespace nt
