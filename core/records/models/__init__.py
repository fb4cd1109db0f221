"""Model connections people manage, the models a picker offers, and what the studio says of a learner before
a run uses it."""
