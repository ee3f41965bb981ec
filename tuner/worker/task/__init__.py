"""The user's task inside the worker: the task file loaded and its data turned into fixed
batches (``task_loader``), from whatever ``model.fit`` takes (``fit_inputs``: arrays, a
dataset, a PyDataset, a generator, class weights), the task's model compiled for a trial,
stepped and watched (``task_model``), and Keras's global state made fresh before each use of it
(``keras_state``).
"""
