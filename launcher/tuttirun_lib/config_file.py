"""--config-file: horovodrun's YAML config file. Its sections and keys set the flags of the
same name; a flag given on the command line wins over the file. Read with PyYAML where it is
importable, else with the small reader below, which takes what these files are made of:
nested mappings of scalars (quoted or plain strings, numbers, booleans, null) and comments.
docs/launcher.md ("A horovodrun config file") lists the keys."""
import re

LOG_LEVELS = ["trace", "debug", "info", "warning", "error", "fatal"]

# section -> key -> (args attribute, kind); kind "not-bool" stores the negation.
KEYS = {
    "params": {
        "fusion_threshold_mb": ("fusion_threshold_mb", "number"),
        "cycle_time_ms": ("cycle_time_ms", "number"),
        "cache_capacity": ("cache_capacity", "int"),
        "hierarchical_allreduce": ("hierarchical_allreduce", "bool"),
        "hierarchical_allgather": ("hierarchical_allgather", "bool"),
        "torus_allreduce": ("torus_allreduce", "bool"),
    },
    "autotune": {
        "enabled": ("autotune", "bool"),
        "log_file": ("autotune_log_file", "string"),
        "warmup_samples": ("autotune_warmup_samples", "int"),
        "steps_per_sample": ("autotune_steps_per_sample", "int"),
        "bayes_opt_max_samples": ("autotune_bayes_opt_max_samples", "int"),
        "gaussian_process_noise": ("autotune_gaussian_process_noise", "number"),
    },
    "timeline": {
        "filename": ("timeline_filename", "string"),
        "mark_cycles": ("timeline_mark_cycles", "bool"),
    },
    "stall_check": {
        "enabled": ("no_stall_check", "not-bool"),
        "warning_time_seconds": ("stall_check_warning_time_seconds", "number"),
        "shutdown_time_seconds": ("stall_check_shutdown_time_seconds", "number"),
    },
    "library_options": {
        "mpi_threads_disable": ("mpi_threads_disable", "bool"),
        "num_nccl_streams": ("num_nccl_streams", "int"),
        "thread_affinity": ("thread_affinity", "int"),
        "gloo_timeout_seconds": ("gloo_timeout_seconds", "number"),
    },
    "logging": {
        "level": ("log_level", "level"),
        "with_timestamp": ("log_with_timestamp", "bool"),
        "hide_timestamp": ("log_with_timestamp", "not-bool"),
    },
}


class ConfigFileError(Exception):
    pass


def load(path, use_yaml=True):
    """The file's top-level mapping. use_yaml=False: always the reader below."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigFileError("%s: cannot read it: %s" % (path, e.strerror or e))
    yaml = None
    if use_yaml:
        try:
            import yaml
        except ImportError:
            pass
    if yaml is not None:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigFileError("%s: not valid YAML: %s" % (path, str(e).replace("\n", " ")))
    else:
        data = parse_mappings(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError("%s: expected a mapping of sections (params:, autotune:, ...), "
                              "got a %s" % (path, type(data).__name__))
    return data


_PLAIN_BAD_START = set("[]{}&*!|>%@`,")
_INT = re.compile(r"[-+]?[0-9]+$")
_FLOAT = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?$")
_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def parse_mappings(text, path):
    """YAML's block mappings of scalars, as PyYAML's safe_load reads them."""
    root = {}
    stack = [(None, root)]  # (indentation of the keys, mapping)
    opened = None  # (indentation, key) of a "key:" with no value on its line
    for number, raw in enumerate(text.split("\n"), 1):
        where = "%s line %d" % (path, number)
        line = _strip_comment(raw).rstrip()
        if not line.strip() or (number == 1 and line == "---"):
            continue
        if line == "...":
            break
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        if body.startswith("\t") or "\t" in line[:indent + 1]:
            raise ConfigFileError("%s: expected indentation by spaces, got a tab" % where)
        if body.startswith("- ") or body == "-":
            raise ConfigFileError("%s: expected 'key: value', got a list item (without "
                                  "PyYAML tuttirun reads mappings of scalars only)" % where)
        key, value = _split_key(body, where)
        if stack[0][0] is None:  # the first key sets the top level's indentation
            stack[0] = (indent, root)
        if opened is not None and indent > opened[0]:
            mapping = {}
            stack[-1][1][opened[1]] = mapping
            stack.append((indent, mapping))
        opened = None  # ("key:" with nothing nested under it stays null, as in YAML)
        while len(stack) > 1 and indent < stack[-1][0]:
            stack.pop()
        if indent != stack[-1][0]:
            raise ConfigFileError("%s: expected the indentation of the keys around it (%d "
                                  "spaces), got %d" % (where, stack[-1][0], indent))
        mapping = stack[-1][1]
        if key in mapping:
            raise ConfigFileError("%s: key '%s' appears twice in one mapping" % (where, key))
        if value == "":
            mapping[key] = None
            opened = (indent, key)
        else:
            mapping[key] = _scalar(value, where)
    return root


def _strip_comment(line):
    """The line without a '#' comment (one at the start or after a space, outside quotes)."""
    quote, i = None, 0
    while i < len(line):
        ch = line[i]
        i += 1
        if quote:
            if ch == "\\" and quote == '"':
                i += 1  # an escaped character
            elif ch == quote and quote == "'" and line[i:i + 1] == "'":
                i += 1  # '' inside '...'
            elif ch == quote:
                quote = None
        elif ch in "'\"" and (i == 1 or line[i - 2] in " :"):
            quote = ch
        elif ch == "#" and (i == 1 or line[i - 2] in " \t"):
            return line[:i - 1]
    return line


def _split_key(body, where):
    if body[0] in "'\"":
        end = body.find(body[0], 1)
        if end < 0 or not body[end + 1:].startswith(":"):
            raise ConfigFileError("%s: expected 'key: value', got %r" % (where, body))
        key, rest = body[1:end], body[end + 2:]
    else:
        m = re.match(r"([^:#]+?):( |$)", body)
        if not m or body[0] in _PLAIN_BAD_START:
            raise ConfigFileError("%s: expected 'key: value', got %r" % (where, body))
        key, rest = m.group(1), body[m.end():]
    return key, rest.strip()


def _scalar(text, where):
    if text[0] in "'\"":
        q = text[0]
        if len(text) < 2 or text[-1] != q:
            raise ConfigFileError("%s: expected a closing %s, got %r" % (where, q, text))
        inner = text[1:-1]
        if q == "'":
            if "'" in inner.replace("''", ""):
                raise ConfigFileError("%s: expected one quoted string, got %r" % (where, text))
            return inner.replace("''", "'")
        if '"' in inner.replace('\\"', ""):
            raise ConfigFileError("%s: expected one quoted string, got %r" % (where, text))
        return inner.replace('\\"', '"').replace("\\n", "\n").replace("\\t", "\t") \
                    .replace("\\\\", "\\")
    if text[0] in _PLAIN_BAD_START:
        raise ConfigFileError("%s: expected a plain scalar (string, number, true/false), got "
                              "%r (without PyYAML tuttirun reads mappings of scalars only)"
                              % (where, text))
    lower = text.lower()
    if lower in ("~", "null"):
        return None
    if lower in _BOOLS and text in (lower, lower.capitalize(), lower.upper()):
        return _BOOLS[lower]
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text) and ("." in text):
        return float(text)
    return text


def apply(args, data, path, given):
    """Sets each attribute the file names and `given` (the command line's) does not.
    Returns warnings (unknown sections and keys)."""
    warnings = []
    for section, body in data.items():
        if section == "controller":
            if not isinstance(body, str) or body.lower() not in ("gloo", "mpi"):
                raise ConfigFileError("%s: controller: expected gloo or mpi, got %r"
                                      % (path, body))
            if not (args.gloo or args.mpi or getattr(args, "jsrun", False)):
                setattr(args, body.lower(), True)
            continue
        if section not in KEYS:
            warnings.append("%s: unknown section '%s' (ignored)" % (path, section))
            continue
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigFileError("%s: %s: expected a mapping of keys, got %r"
                                  % (path, section, body))
        for key, value in body.items():
            if key not in KEYS[section]:
                warnings.append("%s: unknown key '%s.%s' (ignored)" % (path, section, key))
                continue
            attr, kind = KEYS[section][key]
            if value is None or attr in given:
                continue
            setattr(args, attr, _convert(value, kind, "%s: %s.%s" % (path, section, key)))
    return warnings


def _convert(value, kind, who):
    def bad(expected):
        raise ConfigFileError("%s: expected %s, got %r" % (who, expected, value))

    if kind in ("bool", "not-bool"):
        if isinstance(value, bool) or value in (0, 1):
            return bool(value) if kind == "bool" else not value
        bad("true or false")
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            bad("an integer")
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad("a number")
        return value
    if kind == "level":
        if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
            bad("one of " + ", ".join(LOG_LEVELS) + " (any case)")
        return value.lower()
    if isinstance(value, (dict, list)):
        bad("a string")
    return str(value)
