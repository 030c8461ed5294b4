import subprocess,re,sys
for n in sys.argv[1:]:
    f=f'/tmp/fwd4w/tc_{n}.o'
    subprocess.run(['cuobjdump'],capture_output=True) if False else None
    # extract the sm_90 cubin from the host object's fatbin: search ELF magic inside .nv_fatbin
    data=open(f,'rb').read()
    out=[]
    i=data.find(b'\x7fELF',1)
    import io
    while i!=-1:
        blob=data[i:]
        open('/tmp/fwd4w/_x.cubin','wb').write(blob)
        r=subprocess.run(['readelf','-S','-W','/tmp/fwd4w/_x.cubin'],capture_output=True,text=True).stdout
        for m in re.finditer(r'\]\s+(\.text\.\S+)\s+\S+\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)',r):
            k=re.search(r'FastTraitsILi(\d+)ELb(\d)EEELb(\d)',m.group(1))
            if k and k.groups()==('128','0','1'): out.append(int(m.group(3),16)//16)
        if out: break
        i=data.find(b'\x7fELF',i+1)
    print(n,'d128 nc bf16 SASS instructions:',out)
