"""Expected values of tests/calibrate_test.cc's noisy polynomial fit: numpy.polyfit(x, y, 4) on
the samples the test builds (FLUX.1's TeaCache polynomial plus a deterministic ripple).

    /work/main/python/ref/.venv/bin/python python/ref/polyfit_expected.py
"""
import numpy as np

FLUX1 = [4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01]

n = 40
i = np.arange(n, dtype=np.float64)
x = 0.02 + 0.58 * i / (n - 1)
y = np.polyval(FLUX1, x) + 0.05 * np.sin(1.7 * i)
c = np.polyfit(x, y, 4)
r = y - np.polyval(c, x)
print("numpy", np.__version__)
print("coefficients", ", ".join(repr(float(v)) for v in c))
print("rms", repr(float(np.sqrt(np.mean(r * r)))), "max", repr(float(np.abs(r).max())))
