"""The Training-Free GRPO engine: rollouts, training steps, evaluations, the validation gate."""
