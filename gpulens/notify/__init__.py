"""Messages to a job's owner: `gpulens notify` and the sender every feature that tells owners uses (the reclaim
ladder's warnings, advice on starved jobs, digests). docs/notify.md tells how to set it up.

    config.py     the settings file (notify.yaml), every key declared; ConfigError
    addresses.py  an owner (user, account, namespace, the job's own word) -> e-mail addresses and chat handles
    templates.py  each reason's subject and body, in files a site can edit; the fields that fill them
    channels.py   SMTP and chat webhooks; ChannelError, one line naming the server and the fix
    state.py      the state folder: its lock, the cooldown, the held messages, the record
    sender.py     Sender.send(Message) -> Outcome: cooldown, quiet hours, test mode, delivery, record
    reclaim.py    reclaim_notifier(sender): the reclaim service's warnings through the sender
    cli.py        gpulens notify check | send-test
"""
