#include "memory/sysinfo.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

namespace nt::mem {

namespace {

uint64_t meminfo_field(const std::string& file, const std::string& key) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(key + ":", 0) != 0) continue;
        std::istringstream ss(line.substr(key.size() + 1));
        uint64_t kb = 0;
        std::string unit;
        ss >> kb >> unit;
        return unit == "kB" ? kb * 1024 : kb;
    }
    return 0;
}

std::string read_line(const std::string& path) {
    std::ifstream in(path);
    std::string s;
    std::getline(in, s);
    return s;
}

}  // namespace

uint64_t mem_available(const std::string& meminfo) { return meminfo_field(meminfo, "MemAvailable"); }
uint64_t mem_total(const std::string& meminfo) { return meminfo_field(meminfo, "MemTotal"); }

uint64_t default_ram_budget(uint64_t available) {
    const uint64_t margin = std::max<uint64_t>(available / 10, uint64_t(2) << 30);
    return available > margin ? available - margin : 0;
}

uint64_t memlock_limit() {
    struct rlimit r {};
    if (getrlimit(RLIMIT_MEMLOCK, &r) != 0) return 0;
    return r.rlim_cur == RLIM_INFINITY ? std::numeric_limits<uint64_t>::max() : uint64_t(r.rlim_cur);
}

int pcie_gen_of(double gts) {
    if (gts <= 0) return 0;
    if (gts < 4) return 1;    // 2.5
    if (gts < 7) return 2;    // 5
    if (gts < 12) return 3;   // 8
    if (gts < 24) return 4;   // 16
    if (gts < 48) return 5;   // 32
    return 6;                 // 64
}

double pcie_lane_gbs(double gts) {
    // Gen1/2 use 8b/10b encoding, Gen3-5 128b/130b, Gen6 PAM4 with FLIT (~242/256).
    const int g = pcie_gen_of(gts);
    const double eff = g <= 2 ? 0.8 : g <= 5 ? 128.0 / 130.0 : 242.0 / 256.0;
    return gts * eff / 8.0;
}

int PcieLink::gen() const { return pcie_gen_of(speed_gts); }
int PcieLink::max_gen() const { return pcie_gen_of(max_speed_gts); }
double PcieLink::bandwidth_gbs() const { return pcie_lane_gbs(speed_gts) * width; }
double PcieLink::max_bandwidth_gbs() const { return pcie_lane_gbs(max_speed_gts) * max_width; }

PcieLink read_pcie_link(const std::string& bus_id, const std::string& sysfs_root) {
    PcieLink l;
    std::string bdf = bus_id;
    for (char& c : bdf) c = char(std::tolower(static_cast<unsigned char>(c)));
    // cudaDeviceGetPCIBusId gives an 8-digit domain on some systems ("00000000:3b:00.0").
    if (bdf.size() > 12 && bdf.find(':') == 8) bdf = bdf.substr(4);
    const std::string dir = sysfs_root + "/" + bdf + "/";
    const std::string speed = read_line(dir + "current_link_speed");
    const std::string width = read_line(dir + "current_link_width");
    if (speed.empty() || width.empty()) return l;
    l.speed_gts = std::atof(speed.c_str());  // "32.0 GT/s PCIe"
    l.width = std::atoi(width.c_str());
    l.max_speed_gts = std::atof(read_line(dir + "max_link_speed").c_str());
    l.max_width = std::atoi(read_line(dir + "max_link_width").c_str());
    l.known = l.speed_gts > 0 && l.width > 0;
    return l;
}

}  // namespace nt::mem
