"""The environment a worker gets: a local one inherits tuttirun's whole environment, a remote
one what belongs to no host or shell (forwarded_environment), like horovodrun's; -x and the
launcher's TUTTI_* settings add to it or override it. Shared by the plain job (cli.py) and
the elastic driver (elastic.py)."""
import os

from .spawn import SECRET_ENV

# Variables that describe this host, this shell or an outer job, not the training job: they
# stay behind when the environment follows the ranks to other hosts.
HOST_SPECIFIC = {"HOSTNAME", "HOST", "SHLVL", "PWD", "OLDPWD", "_", "DISPLAY", "XAUTHORITY",
                 "TERM", "TERMCAP", "TMUX", "TMUX_PANE", "STY", "WINDOW", "MAIL", "LOGNAME",
                 "USER", "HOME", "SHELL", "TUTTI_SECRET_FILE", SECRET_ENV}
HOST_SPECIFIC_PREFIXES = ("SSH_", "BASH_FUNC_", "OMPI_", "PMIX_", "SLURM_", "XDG_")


def forwarded_environment():
    """This environment as remote ranks get it, like horovodrun's: everything but what
    belongs to this host or shell (HOST_SPECIFIC). -x still adds or overrides."""
    return {name: value for name, value in os.environ.items()
            if name not in HOST_SPECIFIC and not name.startswith(HOST_SPECIFIC_PREFIXES)}


def local_environment(env, secret):
    """The whole environment of a local worker: this one, with `env` over it and the secret
    (which travels in the environment only to local workers)."""
    full = dict(os.environ)
    full.pop("TUTTI_SECRET_FILE", None)
    full.update(env)
    full[SECRET_ENV] = secret
    return full


def remote_environment(env):
    """The variables a remote worker is started with: `env` over forwarded_environment(),
    without the secret (remote_command sends it on ssh's stdin)."""
    return dict(forwarded_environment(), **env)
