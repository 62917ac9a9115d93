// The machine's measured f32 FMA peak in GFLOP/s, on `threads` threads (0: all).
#pragma once

namespace flowkv::ops {
double measure_f32_peak_gflops(int threads, double seconds = 0.2);
}
