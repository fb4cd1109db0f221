"""Training runs as stored: their settings and measured defaults, their outcome and progress in words, no
duplicate job, and whether workers and their jobs are alive."""
