"""The one error type of model loading: it names the file and what is wrong with it."""


class ModelLoadError(ValueError):
    """A model file or folder cannot be loaded; the message names the path and the problem."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
