"""result.py: the result file of a Python bench script, as bench/lib/result.sh writes the shell
scripts': bench/results/<UTC date>-<time>-NAME.md (PD_RESULTS=DIR elsewhere; set and empty:
none), with the date, the command, the commit, the script's own lines about the machine, and its
output."""
import os
import subprocess
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))


def write_result(name, command, body, t0, details=()):
    """name: the file's suffix and title; command: how the run was started; body: its output
    (text or lines); t0: its start (time.time()); details: more '- ...' header lines."""
    d = os.environ.get('PD_RESULTS', os.path.join(ROOT, 'bench', 'results'))
    if not d:
        return None
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, time.strftime('%Y-%m-%d-%H%M', time.gmtime(t0)) + '-' + name + '.md')
    if os.path.exists(path):   # a run started in the same minute: keep both
        path = os.path.join(d, time.strftime('%Y-%m-%d-%H%M%S', time.gmtime(t0)) + '-' + name + '.md')
    commit = subprocess.run(['git', '-C', ROOT, 'describe', '--always', '--dirty'], capture_output=True,
                            text=True).stdout.strip() or 'unknown'
    head = ['# ' + name, '',
            '- date: %s to %s' % (time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t0)),
                                  time.strftime('%H:%M:%S UTC', time.gmtime())),
            '- command: `%s`' % command,
            '- commit: %s' % commit] + ['- ' + x for x in details] + ['']
    if not isinstance(body, str):
        body = '\n'.join(body) + '\n'
    with open(path, 'w') as f:
        f.write('\n'.join(head) + '\n' + body)
    print('wrote', path, file=sys.stderr)
    return path
