"""The error every dataset raises."""


class DataError(Exception):
    """A dataset is missing, corrupt or malformed."""
