"""Writes bench/models/dense-16.tflite: Dense(16, relu) → Dense(1) on a [1, 16] float32 input,
~1 µs a LiteRT call. bench/attach_overhead.py uses it to measure the µs a uprobe pair adds
per call: on a call that short the blocks' own drift is a fraction of a µs, where on the
LSTM (~150-350 µs) it is tens of µs on a shared host. Needs TensorFlow (only to convert).

    .venv/bin/python bench/models/make_dense.py
"""

from pathlib import Path

import tensorflow as tf

tf.keras.utils.set_random_seed(7)
m = tf.keras.Sequential([tf.keras.Input((16,), batch_size=1),
                         tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1)])
out = Path(__file__).resolve().parent / "dense-16.tflite"
out.write_bytes(tf.lite.TFLiteConverter.from_keras_model(m).convert())
print(out)
