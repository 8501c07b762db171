"""Example user tasks, trained with ``model.task=training.examples.<module>:make_task`` (README, "Your own model")."""
