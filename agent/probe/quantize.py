"""Full-integer post-training quantization, run in its own process.

    python -m agent.probe.quantize SAVED_MODEL SIGNATURE|- CALIB.npy OUT.tflite

TensorFlow 2.21's calibrator crashes the whole process (SIGSEGV) on some models — seen here on
the built-in LSTM, whose recurrence the converter lowers to a WHILE loop — so the probe worker
runs the conversion in a child and falls back to dynamic-range quantization when the child
dies by a signal, instead of losing the variant.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import numpy as np
    import tensorflow as tf

    sm, sig, calib_path, out = argv
    calib = np.load(calib_path)
    conv = tf.lite.TFLiteConverter.from_saved_model(sm, signature_keys=None if sig == "-" else [sig])
    conv.optimizations = [tf.lite.Optimize.DEFAULT]

    def rep():
        for i in range(calib.shape[0]):
            yield [np.ascontiguousarray(calib[i:i + 1], dtype=np.float32)]

    conv.representative_dataset = rep
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    try:
        data = conv.convert()
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        msg = next((ln for ln in str(exc).splitlines() if "error:" in ln), str(exc).splitlines()[0])
        print(f"conversion failed: {msg.strip()[:240]}", file=sys.stderr)
        return 2
    with open(out, "wb") as fh:
        fh.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
