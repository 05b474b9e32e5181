// Backend::select_logits' reference: the selection on the host, and the default that copies each
// row to the host first.
#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "core/error.h"

namespace nt {

void check_logit_request(int n_vocab, const LogitRequest& r) {
    if (r.k < 1 || r.k + int(r.ids.size()) > kMaxLogitCandidates)
        fail("logit selection: %d best and %zu tokens asked for (together 1..%d).", r.k,
             r.ids.size(), kMaxLogitCandidates);
    for (int32_t id : r.ids)
        if (id < 0 || id >= n_vocab)
            fail("logit selection: token id %d is outside the vocabulary (%d).", id, n_vocab);
}

void select_logits_host(const float* row, int n_vocab, const LogitRequest& req,
                        LogitCandidates& out) {
    check_logit_request(n_vocab, req);
    struct Item {
        float logit;
        int32_t id;
    };
    // NaN is no candidate (the flag reports it).
    auto better = [](const Item& a, const Item& b) { return ranks_before(a, b); };
    std::vector<Item> heap;  // the k best so far, worst at the front
    const size_t k = size_t(std::min(req.k, n_vocab));
    heap.reserve(k);
    out.nan = false;
    for (int32_t i = 0; i < n_vocab; i++) {
        const Item it{row[i], i};
        if (std::isnan(it.logit)) {
            out.nan = true;
            continue;
        }
        if (heap.size() < k) {
            heap.push_back(it);
            std::push_heap(heap.begin(), heap.end(), better);
        } else if (better(it, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = it;
            std::push_heap(heap.begin(), heap.end(), better);
        }
    }
    std::sort_heap(heap.begin(), heap.end(), better);  // best first
    out.top_id.resize(heap.size());
    out.top_logit.resize(heap.size());
    for (size_t i = 0; i < heap.size(); i++) {
        out.top_id[i] = heap[i].id;
        out.top_logit[i] = heap[i].logit;
    }
    out.id_logit.resize(req.ids.size());
    for (size_t i = 0; i < req.ids.size(); i++) out.id_logit[i] = row[req.ids[i]];
}

void Backend::select_logits(const float* logits, int n_vocab, const std::vector<LogitRequest>& req,
                            std::vector<LogitCandidates>& out) {
    out.resize(req.size());
    std::vector<float> row(size_t(std::max(n_vocab, 0)));
    for (size_t i = 0; i < req.size(); i++) {
        if (req[i].row < 0) fail("logit selection: row %d does not exist.", req[i].row);
        download(logits + size_t(req[i].row) * size_t(n_vocab), row.data(), row.size());
        select_logits_host(row.data(), n_vocab, req[i], out[i]);
    }
}

int32_t Backend::take_token(LogitCandidates* /*from*/, std::vector<float>* /*row*/) {
    fail("this backend does not choose tokens on the device.");
}

}  // namespace nt
