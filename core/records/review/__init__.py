"""People's decisions on what the engine proposed: operations approved, rejected, edited and applied (with the
gate's verdict and the fact checks), and rewards labelled in the queue."""
