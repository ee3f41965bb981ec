"""What a user's training process imports to apply an exported config, from the floor up: every
private Keras name the project touches, in one seam (``keras_internals``); the config's
vocabularies as types, the loss-scale kind and the weight update (``vocabulary``); its data,
checks and file format (``config_data``); the layer walks and the call hook (``layers``) and the
instruments the guard and the tuner's worker both read a model with (``instruments``); where
each layer's dtype came from, and the rule that gives a layer loaded from a saved file or a
config the config's policy (``dtype_origins``); its Keras scope and float32 layer placement
(``scope``, with ``float32_outputs``); a config applied to a model already in memory
(``existing_model``); how much of a model the config's 16-bit dtype reaches (``reach``); loss
scaling and optimizer epsilon (``loss_scaling``), updates for 16-bit weights
(``weight_update``), a custom loop's step made the model's training step (``own_step``), the
precision guard that watches and repairs a whole training (``guard``); and on top
``PrecisionConfig`` (``config``), the data with the three calls that apply it, each importing
its module when called. Imports only ``tuner`` core modules. ``config``, ``config_data`` and
``vocabulary`` import no TensorFlow, so ``from tuner import PrecisionConfig`` stays light; the
modules that apply a config import Keras at their top.
"""
