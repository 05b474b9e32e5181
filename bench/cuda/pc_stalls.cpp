// Where warps stall, kernel by kernel, with the kernels left concurrent: a CUDA injection library
// that samples the program counters of running warps with CUPTI's PC sampling in its continuous
// mode (no serialization, unlike ncu, so a decode step's programmatic launches overlap as they do
// in place) and prints, when the program exits, each kernel's samples by stall reason.
//
//   g++ -shared -fPIC -O2 -I$CUDA/include bench/cuda/pc_stalls.cpp -L$CUPTI_LIB -lcupti
//       -o libnt_pc_stalls.so
//   CUDA_INJECTION64_PATH=$PWD/libnt_pc_stalls.so ntransformer bench ...
//
// NT_PC_PERIOD: the sampling period, 2^N cycles of each multiprocessor (5..31; default 14).
// NT_PC_DETAIL: kernels whose name contains this get a second table, PC by PC (offsets as
//   cuobjdump -sass prints them), the most sampled first.
// NT_PC_OUT: every (kernel, PC, reason, samples) as CSV, for other cuts (pc_sections.py).
// NT_PC_VERBOSE: each collection's PC counts on stderr.
//
// A sample is one warp's state at one instant: `selected` means it issued, every other reason
// is a stall (no_instructions: waiting for its code; long_scoreboard: for global memory or
// L1TEX; wait: a fixed latency; barrier; math_pipe_throttle; ...).
#include <cupti.h>
#include <cupti_pcsampling.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

namespace {

constexpr size_t kMaxPcs = 200000;  // distinct PCs the collection buffer holds

struct State {
    std::mutex mu;
    CUcontext ctx = nullptr;
    bool enabled = false, reported = false;
    std::vector<uint32_t> reason_index;
    std::vector<std::string> reason_name;
    CUpti_PCSamplingData data{};
    std::vector<CUpti_PCSamplingPCData> pcs;
    std::vector<CUpti_PCSamplingStallReason> reasons;  // kMaxPcs x reason count
    // What the collections so far brought: (kernel, PC) -> samples by reason slot.
    std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> got;
    uint64_t dropped = 0, other = 0;
};
// Never destroyed: report() runs at exit, after function-local statics made later are gone.
State& st() {
    static State* s = new State;
    return *s;
}

bool ok(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return true;
    const char* msg = nullptr;
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr, "pc_stalls: %s failed: %s\n", what, msg ? msg : "?");
    return false;
}

std::string demangle(const char* name) {
    if (!name) return "?";
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : name;
    std::free(d);
    return s;
}

// A kernel's name without its return type, namespaces and parameters, its template arguments
// kept: "void nt::cuda::(anonymous namespace)::attn_decode_tiled<128, 4, 256>(...)" gives
// "attn_decode_tiled<128, 4, 256>".
std::string short_kernel(std::string s) {
    for (const std::string anon = "(anonymous namespace)::";;) {
        const size_t at = s.find(anon);
        if (at == std::string::npos) break;
        s.erase(at, anon.size());
    }
    if (s.rfind("void ", 0) == 0) s.erase(0, 5);
    int depth = 0;  // cut at the parameter list: the first '(' outside template arguments
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '<') depth++;
        if (s[i] == '>') depth--;
        if (s[i] == '(' && depth == 0) {
            s.resize(i);
            break;
        }
    }
    const size_t tmpl = s.find('<');
    const size_t ns = s.rfind("::", tmpl == std::string::npos ? std::string::npos : tmpl);
    return ns == std::string::npos ? s : s.substr(ns + 2);
}

// The common prefix of CUPTI's reason names (smsp__pcsamp_warps_issue_stalled_...) dropped.
std::string short_reason(const char* n) {
    std::string s = n ? n : "?";
    for (const char* p : {"smsp__pcsamp_warps_issue_stalled_", "smsp__pcsamp_"})
        if (s.rfind(p, 0) == 0) return s.substr(std::strlen(p));
    return s;
}

void enable(CUcontext ctx) {
    State& s = st();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.enabled) return;  // the first context only (the engine uses one)
    s.ctx = ctx;
    // Enabled first: the stall reasons and the configuration are the enabled context's.
    CUpti_PCSamplingEnableParams ep{};
    ep.size = CUpti_PCSamplingEnableParamsSize;
    ep.ctx = ctx;
    if (!ok(cuptiPCSamplingEnable(&ep), "PCSamplingEnable")) return;
    size_t n = 0;
    CUpti_PCSamplingGetNumStallReasonsParams np{};
    np.size = CUpti_PCSamplingGetNumStallReasonsParamsSize;
    np.ctx = ctx;
    np.numStallReasons = &n;
    if (!ok(cuptiPCSamplingGetNumStallReasons(&np), "GetNumStallReasons")) return;
    s.reason_index.resize(n);
    std::vector<char*> names(n);
    for (auto& p : names) p = static_cast<char*>(std::calloc(CUPTI_STALL_REASON_STRING_SIZE, 1));
    CUpti_PCSamplingGetStallReasonsParams rp{};
    rp.size = CUpti_PCSamplingGetStallReasonsParamsSize;
    rp.ctx = ctx;
    rp.numStallReasons = n;
    rp.stallReasonIndex = s.reason_index.data();
    rp.stallReasons = names.data();
    if (!ok(cuptiPCSamplingGetStallReasons(&rp), "GetStallReasons")) return;
    for (char* p : names) {
        s.reason_name.push_back(short_reason(p));
        std::free(p);
    }

    s.pcs.assign(kMaxPcs, CUpti_PCSamplingPCData{});
    s.reasons.assign(kMaxPcs * n, CUpti_PCSamplingStallReason{});
    for (size_t i = 0; i < kMaxPcs; i++) {
        s.pcs[i].size = sizeof(CUpti_PCSamplingPCData);
        s.pcs[i].stallReason = s.reasons.data() + i * n;
    }
    s.data.size = sizeof(CUpti_PCSamplingData);
    s.data.collectNumPcs = kMaxPcs;
    s.data.pPcData = s.pcs.data();

    const char* pe = std::getenv("NT_PC_PERIOD");
    const uint32_t period = std::clamp(pe ? std::atoi(pe) : 14, 5, 31);
    std::vector<CUpti_PCSamplingConfigurationInfo> cfg(6);
    cfg[0].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD;
    cfg[0].attributeData.samplingPeriodData.samplingPeriod = period;
    cfg[1].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_STALL_REASON;
    cfg[1].attributeData.stallReasonData.stallReasonCount = n;
    cfg[1].attributeData.stallReasonData.pStallReasonIndex = s.reason_index.data();
    cfg[2].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SCRATCH_BUFFER_SIZE;
    cfg[2].attributeData.scratchBufferSizeData.scratchBufferSize = size_t(256) << 20;
    cfg[3].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_COLLECTION_MODE;
    cfg[3].attributeData.collectionModeData.collectionMode =
        CUPTI_PC_SAMPLING_COLLECTION_MODE_CONTINUOUS;
    cfg[4].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_OUTPUT_DATA_FORMAT;
    cfg[4].attributeData.outputDataFormatData.outputDataFormat =
        CUPTI_PC_SAMPLING_OUTPUT_DATA_FORMAT_PARSED;
    cfg[5].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_DATA_BUFFER;
    cfg[5].attributeData.samplingDataBufferData.samplingDataBuffer = &s.data;

    CUpti_PCSamplingConfigurationInfoParams cp{};
    cp.size = CUpti_PCSamplingConfigurationInfoParamsSize;
    cp.ctx = ctx;
    cp.numAttributes = cfg.size();
    cp.pPCSamplingConfigurationInfo = cfg.data();
    if (!ok(cuptiPCSamplingSetConfigurationAttribute(&cp), "SetConfigurationAttribute")) {
        for (const auto& c : cfg)
            if (c.attributeStatus != CUPTI_SUCCESS)
                std::fprintf(stderr, "pc_stalls: attribute %d refused\n", int(c.attributeType));
        return;
    }
    s.enabled = true;
    std::fprintf(stderr, "pc_stalls: sampling every 2^%u cycles, %zu stall reasons\n", period, n);
}

struct Sum {
    uint64_t total = 0;
    std::vector<uint64_t> by_reason;
};

void print_table(const char* title, const std::vector<std::pair<std::string, Sum>>& rows,
                 const std::vector<std::string>& names, uint64_t all) {
    std::printf("%s\n", title);
    for (const auto& [name, sum] : rows) {
        std::vector<size_t> order(sum.by_reason.size());
        for (size_t i = 0; i < order.size(); i++) order[i] = i;
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return sum.by_reason[a] > sum.by_reason[b]; });
        std::printf("%8llu %5.1f%%  %s\n   ", (unsigned long long)sum.total,
                    all ? 100.0 * sum.total / all : 0.0, name.c_str());
        for (size_t k = 0; k < std::min<size_t>(7, order.size()); k++) {
            if (!sum.by_reason[order[k]]) break;
            std::printf(" %s %.0f%%", names[order[k]].c_str(),
                        100.0 * sum.by_reason[order[k]] / sum.total);
        }
        std::printf("\n");
    }
}

// Moves what CUPTI has gathered so far into `got` (CUPTI hands each PC's samples over once).
void collect(State& s) {
    const size_t nr = s.reason_name.size();
    std::map<uint32_t, size_t> slot;  // CUPTI's reason index -> its slot in reason_name
    for (size_t i = 0; i < nr; i++) slot[s.reason_index[i]] = i;
    for (int round = 0; round < 64; round++) {
        for (auto& pc : s.pcs) pc.stallReasonCount = nr;  // room for every reason
        s.data.totalNumPcs = s.data.remainingNumPcs = 0;
        CUpti_PCSamplingGetDataParams gp{};
        gp.size = CUpti_PCSamplingGetDataParamsSize;
        gp.ctx = s.ctx;
        gp.pcSamplingData = &s.data;
        if (!ok(cuptiPCSamplingGetData(&gp), "GetData")) return;
        if (std::getenv("NT_PC_VERBOSE"))
            std::fprintf(stderr, "pc_stalls: collected %zu PCs, %zu remaining\n",
                         s.data.totalNumPcs, s.data.remainingNumPcs);
        s.dropped += s.data.droppedSamples;
        s.other += s.data.nonUsrKernelsTotalSamples;
        for (size_t i = 0; i < s.data.totalNumPcs && i < kMaxPcs; i++) {
            const CUpti_PCSamplingPCData& pc = s.pcs[i];
            auto& v = s.got[{demangle(pc.functionName), pc.pcOffset}];
            v.resize(nr);
            for (size_t r = 0; r < pc.stallReasonCount && r < nr; r++) {
                const auto it = slot.find(pc.stallReason[r].pcSamplingStallReasonIndex);
                if (it != slot.end()) v[it->second] += pc.stallReason[r].samples;
            }
        }
        if (s.data.remainingNumPcs == 0) return;
    }
}

void collect_now() {
    State& s = st();
    std::lock_guard<std::mutex> lock(s.mu);
    try {
        if (s.enabled) collect(s);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pc_stalls: collecting failed: %s\n", e.what());
    }
}

// At exit, from what was collected (no CUPTI call: the context may be gone by then).
void report() {
    State& s = st();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.enabled || s.reported) return;
    s.reported = true;
    const size_t nr = s.reason_name.size();
    std::map<std::string, Sum> by_kernel;
    const char* detail = std::getenv("NT_PC_DETAIL");
    std::vector<std::pair<std::string, Sum>> detail_rows;
    const char* out = std::getenv("NT_PC_OUT");
    FILE* csv = out ? std::fopen(out, "w") : nullptr;
    if (csv) std::fprintf(csv, "kernel,pc,reason,samples\n");
    uint64_t all = 0;
    for (const auto& [key, v] : s.got) {
        const std::string& name = key.first;
        const Sum here{std::accumulate(v.begin(), v.end(), uint64_t(0)), v};
        Sum& k = by_kernel[name];
        k.by_reason.resize(nr);
        k.total += here.total;
        all += here.total;
        for (size_t r = 0; r < nr; r++) {
            k.by_reason[r] += v[r];
            if (csv && v[r])
                std::fprintf(csv, "\"%s\",0x%llx,%s,%llu\n", name.c_str(),
                             (unsigned long long)key.second, s.reason_name[r].c_str(),
                             (unsigned long long)v[r]);
        }
        if (detail && name.find(detail) != std::string::npos && here.total) {
            char label[64];
            std::snprintf(label, sizeof label, "pc 0x%05llx", (unsigned long long)key.second);
            detail_rows.emplace_back(short_kernel(name) + " " + label, here);
        }
    }
    if (csv) std::fclose(csv);
    std::printf(
        "pc_stalls: %llu samples in %zu PCs (%llu dropped by the hardware, %llu in "
        "kernels not the program's)\n",
        (unsigned long long)all, s.got.size(), (unsigned long long)s.dropped,
        (unsigned long long)s.other);
    std::vector<std::pair<std::string, Sum>> rows(by_kernel.begin(), by_kernel.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.total > b.second.total; });
    for (auto& r : rows) r.first = short_kernel(r.first);
    print_table("samples by kernel, then its stall reasons (selected: issuing):", rows,
                s.reason_name, all);
    if (!detail_rows.empty()) {
        std::sort(detail_rows.begin(), detail_rows.end(),
                  [](const auto& a, const auto& b) { return a.second.total > b.second.total; });
        detail_rows.resize(std::min<size_t>(detail_rows.size(), 60));
        print_table("the most sampled PCs of the kernels named by NT_PC_DETAIL:", detail_rows,
                    s.reason_name, all);
    }
    std::fflush(stdout);
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                          const void* data) {
    // The engine's backend destroys its streams as it closes, while the context is alive:
    // what CUPTI holds is collected then (and at every other stream's end: collections add up).
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        if (static_cast<const CUpti_CallbackData*>(data)->callbackSite == CUPTI_API_ENTER)
            collect_now();
        return;
    }
    if (domain != CUPTI_CB_DOMAIN_RESOURCE) return;
    const auto* r = static_cast<const CUpti_ResourceData*>(data);
    if (id == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) enable(r->context);
    if (id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) collect_now();
}

}  // namespace

extern "C" int InitializeInjection(void) {
    CUpti_SubscriberHandle sub;
    if (!ok(cuptiSubscribe(&sub, on_callback, nullptr), "Subscribe") ||
        !ok(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE,
                                CUPTI_CBID_RESOURCE_CONTEXT_CREATED),
            "EnableCallback") ||
        !ok(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE,
                                CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING),
            "EnableCallback") ||
        !ok(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                                CUPTI_RUNTIME_TRACE_CBID_cudaStreamDestroy_v5050),
            "EnableCallback") ||
        !ok(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                                CUPTI_RUNTIME_TRACE_CBID_cudaStreamDestroy_v3020),
            "EnableCallback"))
        return 0;
    std::atexit(report);
    return 1;
}
