"""The judge side of the evaluator: code that decides a verdict and never runs candidate code."""
