"""The Keras guide's GAN ("Customizing what happens in fit()"), small, written for tuning.

A ``keras.Model`` with its own ``compile(d_optimizer, g_optimizer, loss_fn)`` and a
``train_step`` that updates the discriminator and then the generator, and no ``call()``. Two
changes from the guide make it tunable and ready for 16-bit training:

- ``compile_model(model, wrap_optimizer)`` compiles it, passing each optimizer through
  ``wrap_optimizer`` (the trial's loss scale, epsilon and weight update for each);
- ``train_step`` scales each loss with its own optimizer (``optimizer.scale_loss``) before
  taking gradients: under float16 each optimizer then keeps its own loss scale.

The images are synthetic 16x16 blobs, so the example needs no download.

Tune it:   precision-tuner tune examples/dcgan.py --space quick
Apply it:  python examples/dcgan.py best_precision.json   (trains it under the exported config)
"""

import keras
import numpy as np
import tensorflow as tf

BATCH_SIZE = 32
LATENT_DIM = 16


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.seed_generator = keras.random.SeedGenerator(1337)

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real_images):
        if isinstance(real_images, tuple):
            real_images = real_images[0]
        batch_size = tf.shape(real_images)[0]
        latent = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        generated = tf.cast(self.generator(latent), real_images.dtype)
        combined = tf.concat([generated, real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)

        with tf.GradientTape() as tape:   # the discriminator, on real and generated images
            d_loss = self.loss_fn(labels, self.discriminator(combined))
            scaled = self.d_optimizer.scale_loss(d_loss)
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(zip(tape.gradient(scaled, weights), weights))

        latent = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        misleading = tf.zeros((batch_size, 1))
        with tf.GradientTape() as tape:   # the generator, through the discriminator
            g_loss = self.loss_fn(misleading, self.discriminator(self.generator(latent)))
            scaled = self.g_optimizer.scale_loss(g_loss)
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(scaled, weights), weights))

        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def build_model():
    discriminator = keras.Sequential([
        keras.Input(shape=(16, 16, 1)),
        keras.layers.Conv2D(32, 3, strides=2, padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2D(64, 3, strides=2, padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.GlobalMaxPooling2D(),
        keras.layers.Dense(1),
    ], name="discriminator")
    generator = keras.Sequential([
        keras.Input(shape=(LATENT_DIM,)),
        keras.layers.Dense(4 * 4 * 64),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Reshape((4, 4, 64)),
        keras.layers.Conv2DTranspose(64, 4, strides=2, padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2DTranspose(32, 4, strides=2, padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2D(1, 5, padding="same", activation="sigmoid"),
    ], name="generator")
    return GAN(discriminator=discriminator, generator=generator, latent_dim=LATENT_DIM)


def compile_model(model, wrap_optimizer):
    model.compile(
        d_optimizer=wrap_optimizer(keras.optimizers.Adam(learning_rate=3e-4)),
        g_optimizer=wrap_optimizer(keras.optimizers.Adam(learning_rate=3e-4)),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )


def train_data():
    """Gaussian blobs at random places: images a small GAN learns to make in a few hundred
    steps."""
    rng = np.random.default_rng(0)
    grid = np.arange(16, dtype="float32")
    centres = rng.uniform(4, 12, size=(2048, 2)).astype("float32")
    width = rng.uniform(1.5, 3.0, size=(2048, 1, 1)).astype("float32")
    rows = (grid[None, :, None] - centres[:, 0, None, None]) ** 2
    cols = (grid[None, None, :] - centres[:, 1, None, None]) ** 2
    images = np.exp(-(rows + cols) / (2 * width**2))
    return images[..., None].astype("float32")


def val_metric(model):
    """A sample-quality proxy, lower is better, one value per batch of 32 generated images (the
    tuner weighs a difference against their scatter): how far the batch is from the real
    images in its mean image and in its brightest pixel (a blob peaks near 1)."""
    latent = np.random.default_rng(7).normal(size=(256, LATENT_DIM)).astype("float32")
    fake = np.asarray(model.generator(latent, training=False), dtype="float32")
    real = train_data()[-256:]
    values = []
    for batch in np.split(fake, 8):
        mean_gap = np.mean((batch.mean(axis=0) - real.mean(axis=0)) ** 2)
        peak_gap = (batch.max(axis=(1, 2, 3)).mean() - real.max(axis=(1, 2, 3)).mean()) ** 2
        values.append(float(mean_gap + peak_gap))
    return values


if __name__ == "__main__":   # python examples/dcgan.py best_precision.json [epochs]
    import sys

    import tuner

    config = tuner.PrecisionConfig.load(sys.argv[1])
    with config.scope():          # the policy and float32 placements, while the model is built
        model = build_model()
    compile_model(model, config.wrap_optimizer)   # each optimizer: its loss scale and epsilon
    history = model.fit(train_data(), batch_size=BATCH_SIZE, shuffle=True,
                        epochs=int(sys.argv[2]) if len(sys.argv) > 2 else 2, verbose=2)
    quality = np.mean(val_metric(model))
    print(f"trained under {config.describe()}: d_loss {history.history['d_loss'][-1]:.3f}, "
          f"g_loss {history.history['g_loss'][-1]:.3f}, val_metric {quality:.4f}")
