"""The doctor's judgements, pure: parsers of the tools' output, known failures, verdicts."""
