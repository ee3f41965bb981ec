"""A WGAN-GP written as Keras's WGAN-GP example writes it (a critic, a generator, the gradient
penalty on interpolates of real and generated images), its penalty in a layer of its own.

The penalty is a second-order gradient: the critic's gradient with respect to its input, whose
norm is squared and summed over every pixel. This critic's input gradients are large (about 20
per pixel, its first layer's weights drawn wide), so the sum of their squares over 64 pixels,
about 1e5, is beyond float16's largest value (65504): under float16 compute the penalty is
inf at the first step, while float32 trains (the critic brings the norm down towards 1).
"""

import keras
import numpy as np
import tensorflow as tf

BATCH_SIZE = 32
LATENT_DIM = 8


class GradientPenalty(keras.layers.Layer):
    """The mean of (||d critic / d interpolate|| - 1)^2 over the batch."""

    def call(self, real, fake, alpha, critic):
        interpolated = real + alpha * (fake - real)
        with tf.GradientTape() as tape:
            tape.watch(interpolated)
            score = critic(interpolated, training=True)
        grads = tape.gradient(score, interpolated)
        norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=[1, 2, 3]))
        return tf.reduce_mean((norm - 1.0) ** 2)


class WGAN(keras.Model):
    def __init__(self, critic, generator, gp_weight=10.0):
        super().__init__()
        self.critic = critic
        self.generator = generator
        self.gradient_penalty = GradientPenalty(name="gradient_penalty")
        self.gp_weight = gp_weight
        self.seeds = keras.random.SeedGenerator(7)

    def compile(self, c_optimizer, g_optimizer):
        super().compile()
        self.c_optimizer = c_optimizer
        self.g_optimizer = g_optimizer

    def train_step(self, real):
        if isinstance(real, tuple):
            real = real[0]
        batch = tf.shape(real)[0]
        latent = keras.random.normal((batch, LATENT_DIM), seed=self.seeds)
        with tf.GradientTape() as tape:
            fake = tf.cast(self.generator(latent, training=True), real.dtype)
            fake_score = tf.cast(self.critic(fake, training=True), "float32")
            real_score = tf.cast(self.critic(real, training=True), "float32")
            alpha = keras.random.uniform((batch, 1, 1, 1), seed=self.seeds)
            penalty = tf.cast(self.gradient_penalty(real, fake, alpha, critic=self.critic),
                              "float32")
            c_loss = tf.reduce_mean(fake_score) - tf.reduce_mean(real_score) \
                + self.gp_weight * penalty
            scaled = self.c_optimizer.scale_loss(c_loss)
        weights = self.critic.trainable_weights
        self.c_optimizer.apply_gradients(zip(tape.gradient(scaled, weights), weights))

        latent = keras.random.normal((batch, LATENT_DIM), seed=self.seeds)
        with tf.GradientTape() as tape:
            score = tf.cast(self.critic(self.generator(latent, training=True), training=True),
                            "float32")
            g_loss = -tf.reduce_mean(score)
            scaled = self.g_optimizer.scale_loss(g_loss)
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(scaled, weights), weights))
        return {"c_loss": c_loss, "g_loss": g_loss, "gp": penalty}


def build_model():
    critic = keras.Sequential([
        keras.Input(shape=(8, 8, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(64, kernel_initializer=keras.initializers.RandomNormal(stddev=2.0)),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.RandomNormal(stddev=2.0)),
    ], name="critic")
    generator = keras.Sequential([
        keras.Input(shape=(LATENT_DIM,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="sigmoid"),
        keras.layers.Reshape((8, 8, 1)),
    ], name="generator")
    return WGAN(critic=critic, generator=generator)


def compile_model(model, wrap_optimizer):
    model.compile(c_optimizer=wrap_optimizer(keras.optimizers.Adam(1e-3, beta_1=0.5)),
                  g_optimizer=wrap_optimizer(keras.optimizers.Adam(1e-3, beta_1=0.5)))


def train_data():
    rng = np.random.default_rng(0)
    grid = np.arange(8, dtype="float32")
    centres = rng.uniform(2, 6, size=(1024, 2)).astype("float32")
    rows = (grid[None, :, None] - centres[:, 0, None, None]) ** 2
    cols = (grid[None, None, :] - centres[:, 1, None, None]) ** 2
    return np.exp(-(rows + cols) / 4.0)[..., None].astype("float32")
