#include "server/text_stream.h"

#include <algorithm>

namespace nt {

StopTextStream::StopTextStream(const Tokenizer& tok, std::vector<std::string> stops)
    : dec_(tok), stops_() {
    for (std::string& s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopTextStream::push(int32_t id) {
    last_offset_ = decoded_;
    if (stopped_) return "";
    const std::string piece = dec_.push(id);
    decoded_ += piece.size();
    held_ += piece;
    return release(false);
}

std::string StopTextStream::finish() {
    if (stopped_) return "";
    const std::string rest = dec_.flush();
    decoded_ += rest.size();
    held_ += rest;
    return release(true);
}

std::string StopTextStream::release(bool final) {
    // Released text never ends inside a possible stop string, so a stop that appears now starts
    // inside held_.
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) cut = std::min(cut, held_.find(s));
    std::string out;
    if (cut != std::string::npos) {
        out = held_.substr(0, cut);
        held_.clear();
        stopped_ = true;
    } else {
        // Hold back the longest tail of held_ that is a proper prefix of some stop string.
        size_t keep = 0;
        if (!final)
            for (const std::string& s : stops_)
                for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; k--)
                    if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                        keep = k;
                        break;
                    }
        out = held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
    }
    released_ += out.size();
    return out;
}

}  // namespace nt
