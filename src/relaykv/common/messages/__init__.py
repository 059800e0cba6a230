"""Records that cross a layer or process boundary, written once: the step records between
a scheduler and an executor (`steps`) and the OpenAI-style error body (`api_errors`)."""
