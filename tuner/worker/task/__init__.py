"""The user's task inside the worker: the task file loaded and its data turned into fixed
batches (``task_loader``), arrays sampled by row in one seeded order with a share held back
(``array_rows``), from whatever ``model.fit`` takes (``fit_inputs``: arrays, a
dataset, a PyDataset, a generator, class weights), the task's model compiled for a trial,
stepped and watched (``task_model``), and Keras's global state made fresh before each use of it
(``keras_state``).
"""
