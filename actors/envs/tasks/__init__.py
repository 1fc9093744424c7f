"""The shipped environments: tasks a policy is trained on (README.md beside this folder lists them)."""
