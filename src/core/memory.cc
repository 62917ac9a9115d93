#include "core/memory.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "flowkv/error.h"

namespace flowkv {

namespace {
std::atomic<int64_t> g_budget{0};

double gib(int64_t b) {
  return static_cast<double>(b) / double(int64_t{1} << 30);
}
}  // namespace

int64_t available_memory_bytes() {
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    }
    std::fclose(f);
    if (kb >= 0) return static_cast<int64_t>(kb) * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : INT64_MAX;
}

void set_memory_budget_bytes(int64_t bytes) {
  g_budget.store(bytes);
}

int64_t memory_budget_bytes() {
  const int64_t b = g_budget.load();
  return b == 0 ? available_memory_bytes() : b;
}

void check_memory(int64_t need, std::string_view what, std::string_view advice) {
  const int64_t set = g_budget.load();
  if (set < 0) return;
  const int64_t budget = set == 0 ? available_memory_bytes() : set;
  if (need <= budget) return;
  char figures[160];
  std::snprintf(figures, sizeof figures, "%lld bytes (%.2f GiB) but the memory budget is %.2f GiB",
                static_cast<long long>(need), gib(need), gib(budget));
  fail(what, " needs ", figures, set == 0 ? " (the memory available now)" : " (set by the caller)",
       advice.empty() ? "" : "; ", advice);
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream s(line.substr(6));
      int64_t kb = 0;
      s >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  return static_cast<bool>(out);
}

}  // namespace flowkv
