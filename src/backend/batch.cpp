#include "backend/backend.h"

namespace nt {

int Batch::n_logits() const {
    int n = 0;
    for (uint8_t w : want_logits) n += w ? 1 : 0;
    return n;
}

void Batch::clear() {
    tokens.clear();
    pos.clear();
    seq.clear();
    want_logits.clear();
    choose = false;
}

void Batch::add(int32_t token, int32_t position, int32_t sequence, bool logits) {
    tokens.push_back(token);
    pos.push_back(position);
    seq.push_back(sequence);
    want_logits.push_back(logits ? 1 : 0);
}

}  // namespace nt
