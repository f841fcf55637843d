"""Load the runtime layer exactly as a generated script carries it (setup.py.j2 + runtime.py.j2, rendered)."""
import types


def load_layer(name="nbddp_layer"):
    import os

    if os.environ.get("NBDDP_LAYER_FILE"):  # pre-rendered, for machines without the converter's dependencies
        with open(os.environ["NBDDP_LAYER_FILE"], encoding="utf-8") as fh:
            code = fh.read()
    else:
        from nbddp.render import environment

        env = environment()
        code = env.get_template("setup.py.j2").render() + env.get_template("runtime.py.j2").render()
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(code, module.__file__, "exec"), module.__dict__)
    return module
