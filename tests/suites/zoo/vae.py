"""The Keras guide's variational autoencoder, smaller: encoder and decoder models inside a
subclassed model, a Sampling layer, and a custom ``train_step`` that computes its losses by
hand from data without labels (``fit(x)``); no compiled loss (``LOSS = None``) and no
``test_step``. Under mixed_bfloat16, ``model.fit`` itself fails in Sampling (``keras.random.
normal`` draws float32 noise for a bfloat16 mean): keeping Sampling in float32 trains it."""

import keras
import tensorflow as tf
from keras import layers, ops

LOSS = None
BATCH_SIZE = 64


class Sampling(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(shape=ops.shape(z_mean), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.kl_loss_tracker]

    def call(self, x):
        return self.decoder(self.encoder(x)[2])

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(
                keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(), "kl_loss": self.kl_loss_tracker.result()}


def build_model():
    latent_dim = 2
    encoder_inputs = keras.Input(shape=(8, 8, 1))
    x = layers.Conv2D(16, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
    x = layers.Flatten()(x)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(latent_dim, name="z_mean")(x)
    z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
    z = Sampling(name="sampling")([z_mean, z_log_var])
    encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")
    latent_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Dense(4 * 4 * 16, activation="relu")(latent_inputs)
    x = layers.Reshape((4, 4, 16))(x)
    x = layers.Conv2DTranspose(16, 3, activation="relu", strides=2, padding="same")(x)
    decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
    decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")
    return VAE(encoder, decoder)


def train_data():
    """Images only, as the guide's ``vae.fit(mnist_digits)``: a dataset of x, no labels
    (scikit-learn's 8x8 digits, on disk)."""
    from sklearn.datasets import load_digits

    images = (load_digits().images / 16.0).astype("float32")[..., None]
    return tf.data.Dataset.from_tensor_slices(images).batch(BATCH_SIZE)
