"""Tasks and what they hold: a task's settings and task files, its samples and datasets, its conversation
scenarios and personas, its libraries by name, and the built-in demo tasks."""
