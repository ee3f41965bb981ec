"""The guide's DCGAN (examples/dcgan.py) with two changes GAN code often has: a discriminator
that ends in a sigmoid, and the cross-entropy written out by hand, in the model's compute dtype.

In float16, a sigmoid rounds to exactly 1.0 from a logit of about 7.6 (float32: about 17), and
log(1 - 1.0) is -inf: once the discriminator is sure of a real image, its loss is inf, while
float32's stays finite. The generator's loss is still finite at that step.
"""

import importlib.util
from pathlib import Path

import keras
import tensorflow as tf

_spec = importlib.util.spec_from_file_location(
    "guide_dcgan", Path(__file__).resolve().parents[2] / "examples" / "dcgan.py")
guide = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guide)

BATCH_SIZE = guide.BATCH_SIZE
train_data = guide.train_data


def cross_entropy(labels, probabilities):
    labels = tf.cast(labels, probabilities.dtype)
    return -tf.reduce_mean(labels * tf.math.log(probabilities)
                           + (1.0 - labels) * tf.math.log(1.0 - probabilities))


def build_model():
    gan = guide.build_model()
    # The guide's discriminator, its last layer with a sigmoid.
    discriminator = keras.Sequential([keras.Input(shape=(16, 16, 1)),
                                      *gan.discriminator.layers[:-1],
                                      keras.layers.Dense(1, activation="sigmoid")],
                                     name="discriminator")
    return guide.GAN(discriminator=discriminator, generator=gan.generator,
                     latent_dim=guide.LATENT_DIM)


def compile_model(model, wrap_optimizer):
    model.compile(d_optimizer=wrap_optimizer(keras.optimizers.Adam(learning_rate=3e-3)),
                  g_optimizer=wrap_optimizer(keras.optimizers.Adam(learning_rate=3e-4)),
                  loss_fn=cross_entropy)
