"""What evaluations show: their figures (Mean@k, Pass@k with intervals), their counts, and the paired comparison
of two of them that every promotion and gate reads."""
