"""The one exception class users and the CLI catch: bad input, never a bug in qkov."""


class QkovError(Exception):
    """A problem with the user's input (corpus, checkpoint, config, tokens).

    The message is one line that names the problem and, where there is one, the tensor or file.
    The command-line interface prints it on stderr and exits with status 2.
    """
