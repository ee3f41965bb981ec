"""What a user's training process imports to apply an exported config: the
``PrecisionConfig`` data (``config``) and its vocabularies as types, the loss-scale kind and the
weight update (``vocabulary``), its Keras scope and float32 layer placement (``scope``),
loss scaling and optimizer epsilon (``loss_scaling``), and updates for 16-bit weights
(``weight_update``), the precision guard that watches and repairs a whole training
(``guard``), and the instruments it and the tuner's worker both read a model with
(``instruments``). Imports only ``tuner`` core modules; TensorFlow and Keras are imported
inside the functions that need them, so ``from tuner import PrecisionConfig`` stays light.
"""
