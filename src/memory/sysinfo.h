// What the host says about memory and the GPU's PCIe link, read from /proc and /sys without
// root: the RAM budget's default, the locked-memory limit, and the link the doctor reports.
#pragma once
#include <cstdint>
#include <string>

namespace nt::mem {

// MemAvailable from /proc/meminfo (bytes); 0 when it cannot be read.
uint64_t mem_available(const std::string& meminfo = "/proc/meminfo");
uint64_t mem_total(const std::string& meminfo = "/proc/meminfo");
// The default RAM budget: what is available minus a margin for everything else (10%, at least
// 2 GiB).
uint64_t default_ram_budget(uint64_t available);

// RLIMIT_MEMLOCK soft limit in bytes; UINT64_MAX when unlimited.
uint64_t memlock_limit();

struct PcieLink {
    bool known = false;
    double speed_gts = 0, max_speed_gts = 0;  // GT/s per lane
    int width = 0, max_width = 0;
    int gen() const;      // 1..6 from the speed; 0 when unknown
    int max_gen() const;
    double bandwidth_gbs() const;  // usable one-way payload bandwidth of the current link
    double max_bandwidth_gbs() const;
};

// "0000:3B:00.0" -> the link of /sys/bus/pci/devices/0000:3b:00.0 (under `sysfs_root`).
PcieLink read_pcie_link(const std::string& bus_id, const std::string& sysfs_root = "/sys/bus/pci/devices");
int pcie_gen_of(double gts);
double pcie_lane_gbs(double gts);  // payload GB/s per lane and direction after encoding

}  // namespace nt::mem
