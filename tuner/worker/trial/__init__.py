"""One trial, plain data in and out: the config applied, the user's model built, checked and
trained a budget of timed steps, validated and measured (``trial``), its timed steps with
``model.fit`` itself (``steps``), the evaluation on the validation batches (``validation``),
its training memory (``memory``), an error read into a failure class, a reason and a layer
(``error_reading``), and the models kept alive for the re-measurement and the confirmation
(``live_models``), which later runs train on (``live``).
"""
