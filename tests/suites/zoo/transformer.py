"""Keras's "text classification with Transformer" example, shrunk: a token-and-position
embedding layer and a transformer block written as Layer subclasses (MultiHeadAttention, a
Sequential feed-forward net, LayerNormalization, Dropout)."""

import keras
import numpy as np
from keras import layers, ops

VOCAB = 200
MAXLEN = 16
BATCH_SIZE = 32
LOSS = "sparse_categorical_crossentropy"
METRICS = ["accuracy"]


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                     layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


def build_model():
    inputs = layers.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB, 16)(inputs)
    x = TransformerBlock(16, 2, 16)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def make_optimizer():
    return keras.optimizers.Adam(3e-3)


def train_data():
    rng = np.random.default_rng(6)
    x = rng.integers(0, VOCAB, size=(384, MAXLEN))
    y = (np.sum(x[:, :4] < VOCAB // 2, axis=1) >= 2).astype("int32")
    return x, y
