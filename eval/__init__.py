"""whiflash-eval: benchmark decoding methods against AR (bench), rebuild reports (report), calibrate thresholds."""
