"""Evaluate an untrusted arithmetic/Python expression in a locked-down subprocess.

Layers, each enough on its own for arithmetic and together for hostile input:
- the child parses the expression and allows only a whitelist of AST nodes (numbers, arithmetic and
  comparison operators, a few builtins such as `abs`, `min`, `sum`, `range`): no attributes, no imports,
  no names beyond the whitelist, no lambdas;
- resource limits set inside the child before it reads the expression: CPU seconds (`RLIMIT_CPU`),
  address space (`RLIMIT_AS`), no file writes (`RLIMIT_FSIZE` 0), no new file descriptors
  (`RLIMIT_NOFILE` 3: stdin/stdout/stderr only, so no files and no sockets, hence no network),
  no child processes (`RLIMIT_NPROC` 0);
- an isolated interpreter (`python -I -S`, empty environment, cwd `/`) and a wall-clock limit enforced by
  the parent, which kills the child's process when it runs over.
"""
from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

CHILD = r'''
import ast, math, resource, sys
cpu_s, mem_bytes = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (3, 3))
src = sys.stdin.read(4096)
ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp, ast.Constant, ast.Call,
           ast.Name, ast.Load, ast.Tuple, ast.List, ast.operator, ast.unaryop, ast.cmpop, ast.boolop,
           ast.keyword, ast.GeneratorExp, ast.comprehension, ast.Store)
FUNCS = {"abs": abs, "min": min, "max": max, "sum": sum, "range": range, "round": round, "pow": pow,
         "len": len, "int": int, "float": float, "sqrt": math.sqrt, "gcd": math.gcd, "factorial": math.factorial}
try:
    tree = ast.parse(src.strip(), mode="eval")
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if not isinstance(node, ALLOWED):
            raise ValueError("not allowed: " + type(node).__name__)
        if isinstance(node, ast.Name) and node.id not in FUNCS and node.id not in bound:
            raise ValueError("unknown name " + node.id)
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
            raise ValueError("only numbers")
    value = eval(compile(tree, "<expr>", "eval"), {"__builtins__": {}}, dict(FUNCS))
    out = "ok " + repr(value)
except MemoryError:
    out = "error out of memory"
except Exception as exc:
    out = "error " + type(exc).__name__ + ": " + str(exc)[:200]
sys.stdout.write(out[:500])
'''


@dataclass
class SandboxResult:
    ok: bool
    text: str  # the value's repr, or the error


async def evaluate(expression: str, *, cpu_s: int = 1, wall_s: float = 3.0,
                   memory_bytes: int = 256 * 1024 * 1024) -> SandboxResult:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", CHILD, str(cpu_s), str(memory_bytes),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={}, cwd="/")  # in its parent's process group: an environment worker killed with its group takes it
    try:
        out, err = await asyncio.wait_for(proc.communicate(expression.encode()[:4096]), wall_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return SandboxResult(False, "error time limit")
    text = out.decode(errors="replace").strip()
    if text.startswith("ok "):
        return SandboxResult(True, text[3:])
    if text.startswith("error "):
        return SandboxResult(False, text)
    # killed by RLIMIT_CPU (SIGXCPU) or another signal before it could answer
    return SandboxResult(False, "error cpu limit" if proc.returncode in (-24, -9) else f"error exit {proc.returncode}")
