"""A GAN trained by a custom training loop: a generator and a discriminator, two optimizers,
one ``train_step`` function of the loop's own, no ``fit``.

The points are a ring of eight Gaussians (the classic small GAN test: a generator that
collapses onto a few of them shows at once), made in NumPy, so the example needs no download.

The same file is the task the tuner tunes and the script that trains under its pick:

- ``build_model()`` returns a ``keras.Model`` holding both networks (no ``call()``: the step
  calls each part), ``make_optimizer()`` the two optimizers by name, and ``train_step(model,
  optimizer, batch)`` is the loop's step. The tuner runs that step in its trials with every
  optimizer wrapped for the trial's config (``optimizer["generator"]`` is then a loss-scaled
  one under float16), times it and judges each of its losses against float32's, and
  ``val_metric`` on the samples.
- Run as a script, it trains in its own loop under the exported config, with the guard watching
  every step (``cfg.loop_guard``), and prints what the guard did.

Tune it:   precision-tuner tune examples/gan_loop.py --space quick
Apply it:  python examples/gan_loop.py best_precision.json [epochs]
"""

import keras
import numpy as np
import tensorflow as tf

BATCH_SIZE = 64
LATENT_DIM = 8
MODES = np.array([(np.cos(a), np.sin(a)) for a in np.arange(8) * np.pi / 4], "float32") * 2.0


class GAN(keras.Model):
    """The two networks and the random numbers the step draws (seeded: every trial draws the
    same)."""

    def __init__(self):
        super().__init__()
        self.generator = keras.Sequential([
            keras.Input(shape=(LATENT_DIM,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(2),
        ], name="generator")
        self.discriminator = keras.Sequential([
            keras.Input(shape=(2,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(1),
        ], name="discriminator")
        self.seed_generator = keras.random.SeedGenerator(1337)


def build_model():
    return GAN()


def make_optimizer():
    return {"generator": keras.optimizers.Adam(2e-4, beta_1=0.5),
            "discriminator": keras.optimizers.Adam(2e-4, beta_1=0.5)}


_bce = keras.losses.BinaryCrossentropy(from_logits=True)


def train_step(model, optimizer, batch):
    """One step of the loop: the discriminator on real and generated points, then the
    generator through it. Each loss is scaled by its own optimizer inside its tape
    (``scale_loss``: the loss unchanged where the config has no loss scale)."""
    real = batch[0] if isinstance(batch, tuple) else batch
    count = tf.shape(real)[0]
    latent = keras.random.normal((count, LATENT_DIM), seed=model.seed_generator)
    fake = tf.cast(model.generator(latent, training=True), real.dtype)
    d_weights = model.discriminator.trainable_weights
    with tf.GradientTape() as tape:
        real_logits = model.discriminator(real, training=True)
        fake_logits = model.discriminator(fake, training=True)
        d_loss = _bce(tf.ones_like(real_logits), real_logits) \
            + _bce(tf.zeros_like(fake_logits), fake_logits)
        scaled = optimizer["discriminator"].scale_loss(d_loss)
    optimizer["discriminator"].apply_gradients(zip(tape.gradient(scaled, d_weights), d_weights))

    latent = keras.random.normal((count, LATENT_DIM), seed=model.seed_generator)
    g_weights = model.generator.trainable_weights
    with tf.GradientTape() as tape:
        fake_logits = model.discriminator(model.generator(latent, training=True), training=True)
        g_loss = _bce(tf.ones_like(fake_logits), fake_logits)
        scaled = optimizer["generator"].scale_loss(g_loss)
    optimizer["generator"].apply_gradients(zip(tape.gradient(scaled, g_weights), g_weights))
    return {"d_loss": d_loss, "g_loss": g_loss}


def train_data():
    """8192 points of the ring, in random order."""
    rng = np.random.default_rng(0)
    modes = rng.integers(0, len(MODES), size=8192)
    return (MODES[modes] + 0.05 * rng.normal(size=(8192, 2))).astype("float32")


def val_metric(model):
    """A sample-quality proxy, lower is better, one value per batch of 128 generated points
    (the tuner weighs a difference against their scatter): each point's distance to its
    nearest mode, plus the share of the eight modes the batch misses."""
    latent = np.random.default_rng(7).normal(size=(1024, LATENT_DIM)).astype("float32")
    points = np.asarray(model.generator(latent, training=False), dtype="float32")
    values = []
    for batch in np.split(points, 8):
        distances = np.linalg.norm(batch[:, None, :] - MODES[None], axis=-1)
        missed = 1.0 - len(set(distances.argmin(axis=1))) / len(MODES)
        values.append(float(distances.min(axis=1).mean() + missed))
    return values


def train(config, epochs=5, verbose=1):
    """The loop a user writes, guarded: the model built under the config, each optimizer
    wrapped by it, and every step run through the guard. Returns the model and the guard."""
    keras.utils.set_random_seed(0)
    with config.scope():          # the policy and float32 placements, while the model is built
        model = build_model()
    optimizer = {name: config.wrap_optimizer(opt) for name, opt in make_optimizer().items()}
    data = tf.data.Dataset.from_tensor_slices(train_data()).shuffle(8192, seed=0)
    data = data.batch(BATCH_SIZE, drop_remainder=True)
    guard = config.loop_guard(model, optimizer, train_step, epochs=epochs,
                              steps_per_epoch=len(data), verbose=verbose)
    with guard:
        for epoch in range(epochs):
            for batch in data:
                losses = guard.step(batch)
            quality = float(np.mean(val_metric(model)))
            guard.end_epoch(val_metric=quality)
            if verbose:
                print(f"epoch {epoch + 1}: d_loss {losses['d_loss']:.3f}, "
                      f"g_loss {losses['g_loss']:.3f}, val_metric {quality:.3f}")
    return model, guard


if __name__ == "__main__":   # python examples/gan_loop.py best_precision.json [epochs]
    import sys

    import tuner

    config = tuner.PrecisionConfig.load(sys.argv[1])
    model, guard = train(config, epochs=int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    print(f"trained under {config.describe()}: {len(guard.events)} guard events"
          + "".join(f"\n  {event.line()}" for event in guard.events))
    if guard.config != config:
        print("the guard repaired the config: guard.config.save('repaired.json') for next time")
