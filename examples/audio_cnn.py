"""Audio classification on MFCCs: 4 conv blocks with BatchNorm and a softmax output.

The classic "my fp16 audio CNN gives NaN" case. The audio is synthetic (tones of several
classes with harmonics and noise, so nothing is downloaded); the MFCCs are computed with
``tf.signal`` exactly as one would for real recordings.

Tune it:  precision-tuner tune examples/audio_cnn.py --space quick
"""

import keras
import numpy as np

BATCH_SIZE = 32
LOSS = "sparse_categorical_crossentropy"
METRICS = ["accuracy"]

CLASSES = 6
SAMPLE_RATE = 8000
CLIP_SECONDS = 0.5
MFCC_COEFFICIENTS = 20


def build_model():
    inputs = keras.Input(shape=(None, MFCC_COEFFICIENTS, 1), name="mfcc")
    x = inputs
    for filters in (16, 32, 32, 64):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation("relu")(x)
        x = keras.layers.MaxPooling2D(pool_size=(2, 1), padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.1)(x)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="class_probs")(x)
    return keras.Model(inputs, outputs, name="audio_cnn")


def make_optimizer():
    return keras.optimizers.Adam(1e-3)


def _tones(count, rng):
    t = np.arange(int(SAMPLE_RATE * CLIP_SECONDS)) / SAMPLE_RATE
    labels = rng.integers(0, CLASSES, size=count)
    base = 220.0 * 2 ** (labels / 3.0)  # each class a pitch a major third apart
    detune = rng.uniform(0.97, 1.03, size=count)
    freq = (base * detune)[:, None]
    clips = sum((0.6 / h) * np.sin(2 * np.pi * h * freq * t + rng.uniform(0, 2 * np.pi))
                for h in (1, 2, 3))
    clips += rng.normal(0, 0.2, size=clips.shape)
    return clips.astype("float32"), labels.astype("int32")


def mfcc(clips):
    import tensorflow as tf

    stft = tf.signal.stft(clips, frame_length=256, frame_step=128, fft_length=256)
    spectrogram = tf.abs(stft)
    mel = tf.signal.linear_to_mel_weight_matrix(
        num_mel_bins=40, num_spectrogram_bins=spectrogram.shape[-1], sample_rate=SAMPLE_RATE,
        lower_edge_hertz=60.0, upper_edge_hertz=3800.0)
    log_mel = tf.math.log(tf.tensordot(spectrogram, mel, 1) + 1e-6)
    coefficients = tf.signal.mfccs_from_log_mel_spectrograms(log_mel)[..., :MFCC_COEFFICIENTS]
    return coefficients.numpy()[..., None]


def train_data():
    rng = np.random.default_rng(0)
    clips, labels = _tones(BATCH_SIZE * 40, rng)
    return mfcc(clips), labels
