"""The checks before anything starts, each failure a ConfigError naming the setting (exit status 2).

    preflight.py  what loading a configuration cannot check without role code or the file system
                  (`turnstream check` and every command that starts a role), and the models a run needs
    addresses.py  at a role process's start: the addresses it binds are this host's, its peers' names resolve
"""
