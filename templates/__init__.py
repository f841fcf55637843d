# Jinja2 templates of the generated script; installed as the package nbddp.templates.
