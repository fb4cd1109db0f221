"""Production: traces from the JSON route and OTLP, served libraries, scores and their precedence, the judge's
scoring in the worker, A/B experiments with their verdict and what ends them. The top floor of the records."""
