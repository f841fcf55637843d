"""Load the whole runtime exactly as a generated script carries it (nbddp/runtime/ inlined by nbddp.inline), and
start it as the script does, but for the process group: the cases start and end their own groups."""
import types


def load_layer(name="nbddp_layer"):
    from nbddp.inline import everything, render

    code = render(everything())
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(code + "\nnbddp_start(group=False)\n", module.__file__, "exec"), module.__dict__)
    return module
