"""Example user tasks, trained with ``model.task=spotray.examples.<module>:make_task`` (docs/own-model.md)."""
