"""The worker side: code that runs inside a TensorFlow worker process (trials, the task check,
diagnostics). TensorFlow/Keras is imported here and in two modules outside it that apply a
config in the user's own process: ``tuner.apply.scope`` (dtype policies, float32 placement)
and ``tuner.apply.loss_scaling`` (loss-scale optimizers). The driver — cli, plan, proposer,
scheduler, remeasure, decision, job, tracking — never imports TensorFlow."""
