"""The web UI's side of the server: the documents its pages read (`summary`, `graph`),
computed from the folded state and the playbook so that a page's size follows the
playbook's steps, not a loop's iterations."""
