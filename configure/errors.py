"""The one exception for what a user can fix: raised with a message that names the problem and
the fix. It lives here, below the package, so that configure imports nothing from orthogpt; the
package's scripts print it as one line (orthogpt.errors.entry)."""


class UserError(Exception):
    pass
