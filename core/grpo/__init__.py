"""The Training-Free GRPO loop, the studio's engine: rollouts, training steps, evaluations, the validation gate.

The package is `grpo`, not `engine`, so that in this tree "engine" means one thing: a database's SQLAlchemy
Engine (the first argument of every records function that owns its transaction).
"""
