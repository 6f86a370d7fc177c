"""List every option of the plugin's criterions, tasks and models (the generators
are configured through their tasks), with its default, its declared rule and help:

    python -m fairseq_ext.options                 # every plugin component
    python -m fairseq_ext.options mgs text_completion tagging_lstm_ner

A NAME is a criterion, task, model or architecture name. The options are the ones
fairseq adds to its parser when the component is chosen (``--criterion mgs``),
grouped by the config class that declares them, fairseq's inherited ones included.
``fairseq-train --user-dir "$(fairseq-ext-dir)" --criterion mgs --help`` lists the same
for the chosen components (``fairseq_ext.runtime.parser``); the listing itself is
``fairseq_ext.runtime.components``'s.
"""
import argparse
import sys
from typing import List, Optional, Sequence

from fairseq_ext.runtime.components import Component, component_options, plugin_components, plugin_flags  # noqa: F401

def format_component(component: Component) -> str:
    head = f"--{component.kind} {component.name}"
    if component.kind == "model":
        head = f"--arch {', '.join(component.archs)}  (model {component.name})"
    lines, group = [f"{head}  [{component.cls.__module__}]"], None
    for o in component_options(component):
        if o.declared_by != group:
            group = o.declared_by
            lines.append(f"  {group or 'other'}:")
        choices = f" {{{','.join(map(str, o.choices))}}}" if o.choices else ""
        rule = f"; must be {o.rule}" if o.rule and not o.choices else ""  # a choice list says it already
        lines.append(f"    {', '.join(o.flags)}{choices}  (default: {o.default}{rule})")
        if o.help:
            lines.append(f"        {o.help}")
    return "\n".join(lines)


def select(names: Sequence[str]) -> List[Component]:
    """The components called ``names`` (criterion, task, model or architecture names)."""
    components = plugin_components()
    if not names:
        return components
    known = {c.name: c for c in components}
    known.update({a: c for c in components for a in c.archs})
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"no plugin component named {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return list(dict.fromkeys(known[n] for n in names))


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fairseq_ext.options", description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", metavar="NAME", help="criterion, task, model or architecture (default: all)")
    args = p.parse_args(argv)
    try:
        components = select(args.names)
    except KeyError as e:
        p.error(e.args[0])
    print("\n\n".join(format_component(c) for c in components))


if __name__ == "__main__":
    sys.exit(main())
